"""Lesson 02's exercises."""

from __future__ import annotations
