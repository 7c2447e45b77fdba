"""The build: one pipeline that folds the steps over an explicit state (R6, R9–R11).

:mod:`~ctxwarden.pipeline.engine` is the entry point (``build_context``); the policy, the
state a later turn needs, the audit and tool-call pairing live beside it.
"""
