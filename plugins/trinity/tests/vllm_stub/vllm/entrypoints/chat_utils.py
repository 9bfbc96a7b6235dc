ChatTemplateContentFormat = str
ConversationMessage = dict


def parse_chat_messages(*args, **kwargs):
    raise RuntimeError("vLLM is stubbed in agenttune's CPU tests: parse_chat_messages is not available")


async def parse_chat_messages_async(*args, **kwargs):
    raise RuntimeError("vLLM is stubbed in agenttune's CPU tests: parse_chat_messages_async is not available")
