"""Storage: open, read ranges of and write atomically the files a URL names: local, s3://, http(s)://."""
