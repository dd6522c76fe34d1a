"""Helpers for testing slotwise and its plugins: toy models with splitting ops."""
