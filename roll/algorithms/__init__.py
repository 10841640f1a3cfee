"""roll.algorithms"""
