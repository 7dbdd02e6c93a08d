"""The console's data sources: how it reaches the box (transport), what it asks for
(session), and what it makes of the answers (state). Plain asyncio; never imports Textual
or torch, so it is tested without an App."""
