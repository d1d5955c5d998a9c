"""Test harnesses that build what the tests run in (issue 36: foreign images)."""
