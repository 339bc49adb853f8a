"""dl2ray/schedulers"""
