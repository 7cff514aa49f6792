class ParseError(ValueError):
    """A line that is not a comment, a section header or a key/value pair."""

    def __init__(self, lineno, message):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno
