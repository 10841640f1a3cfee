"""roll.config"""
