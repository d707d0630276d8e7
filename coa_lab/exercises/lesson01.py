"""Lesson 01's exercises."""

from __future__ import annotations
