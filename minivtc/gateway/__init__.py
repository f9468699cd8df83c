"""The fair gateway: one VTC in front of many `minivtc serve` backends (or vLLM servers),
its HTTP app, its proxy, and `minivtc demo --replicas N`. The dispatcher it runs is
`fleet/dispatcher.py`.
"""
