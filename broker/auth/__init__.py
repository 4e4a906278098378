"""Who may do what: bearer tokens and their rights on stream-name globs (docs/broker.md).

``tokens.py`` is the tokens file (format, checks, constant-time lookup);
``access.py`` holds the live table, reloads it (SIGHUP, file changes) and
answers the servicers' one question: may this call's token do ``right`` on
``stream``?
"""
