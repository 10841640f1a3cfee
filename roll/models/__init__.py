"""roll.models"""
