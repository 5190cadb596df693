"""Where a row keeps its conversation (``--chat``): a messages column, or a prompt and a completion column. The row
readers (``rows``) name these columns when a row lacks its text column, and ``chat`` reads conversations with them."""

from __future__ import annotations

from dataclasses import dataclass

from nanoset.errors import MissingColumnError


@dataclass(frozen=True)
class ChatColumns:
    """Where a row keeps its conversation: a messages column, or a prompt and a completion column."""

    messages: str = "messages"
    prompt: str = "prompt"
    completion: str = "completion"

    def choose(self, names: list[str], where: str) -> list[str]:
        """The columns to read from a table with columns ``names``: messages first, else prompt + completion."""
        if self.messages in names:
            return [self.messages]
        if self.prompt in names and self.completion in names:
            return [self.prompt, self.completion]
        raise MissingColumnError(where, self.messages, names,
                                 option=f"--messages-column, or --prompt-column and --completion-column "
                                        f"(no {self.prompt!r} + {self.completion!r} pair either)")


def holds_conversations(columns: list[str]) -> bool:
    """Whether a table of ``columns`` looks like conversations (``--chat``'s default columns: messages, or
    prompt and completion)."""
    chat = ChatColumns()
    return chat.messages in columns or {chat.prompt, chat.completion} <= set(columns)
