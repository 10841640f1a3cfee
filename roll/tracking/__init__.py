"""roll.tracking"""
