"""``brainstem dashboard``: the agent in a browser, served by the runtime itself (:mod:`.app`).

Imported only by that command: the wake's sleep path never loads Starlette, Jinja2 or uvicorn.
"""
