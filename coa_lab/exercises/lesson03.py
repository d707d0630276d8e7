"""Lesson 03's exercises."""

from __future__ import annotations
