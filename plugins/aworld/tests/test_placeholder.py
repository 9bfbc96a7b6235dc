def test_import():
    import aworld  # noqa: F401
