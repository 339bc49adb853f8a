"""dl2ray/traces"""
