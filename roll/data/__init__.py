"""roll.data"""
