"""dl2ray"""
