"""Event store and blob store tests."""
