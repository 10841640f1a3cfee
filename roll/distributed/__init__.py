"""roll.distributed"""
