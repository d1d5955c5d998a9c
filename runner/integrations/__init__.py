"""Drop-in sandboxes for the agent frameworks: each module is one framework's interface over toolcage's
``Sandbox``/``AsyncSandbox`` (the same hardened container, policy, egress allowlist, secrets and audit log).

- ``openai_agents``: a ``BaseSandboxClient`` for the OpenAI Agents SDK's ``SandboxAgent`` (extra ``openai-agents``);
- ``deepagents``: a ``BaseSandbox`` backend for LangChain Deep Agents (extra ``deepagents``);
- ``langchain``: toolcage's tools as LangChain ``StructuredTool``s bound to an open sandbox (extra ``langchain``).

A module imports its framework when it is imported, never before: the core needs none of them.
"""
