"""roll.strategies"""
