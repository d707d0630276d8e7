"""Lesson 07's exercises."""

from __future__ import annotations
