"""The exception type a user can cause; the CLI prints it as a single line."""


class NanosetError(ValueError):
    """A user-facing error: the message names the file, key or value and says what to do."""


class MissingColumnError(NanosetError):
    """An input lacks the text column. Carries the facts, so a caller (the CLI, or the runtime's
    Hugging Face stages) can name its own option for the column; pickles across worker processes."""

    def __init__(self, where: str, column: str, columns: list[str], option: str = "--text-column") -> None:
        super().__init__(where, column, columns, option)
        self.where, self.column, self.columns, self.option = where, column, list(columns), option

    def __str__(self) -> str:
        return (f"{self.where}: no column {self.column!r}; the columns there are: "
                f"{', '.join(map(str, self.columns)) or 'none'} (choose one with {self.option})")
