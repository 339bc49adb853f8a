"""clusters"""
