"""roll.rewards"""
