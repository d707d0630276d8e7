"""Lesson 06's exercises."""

from __future__ import annotations
