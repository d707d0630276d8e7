"""Lesson 05's exercises."""

from __future__ import annotations
