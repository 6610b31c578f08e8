"""Reporters draw a finished diagnosis; they compute nothing."""
