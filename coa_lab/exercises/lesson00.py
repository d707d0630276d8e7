"""Lesson 00's exercises."""

from __future__ import annotations
