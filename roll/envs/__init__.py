"""roll.envs"""
