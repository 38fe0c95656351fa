"""Talker stage service (text -> codec codes)."""
