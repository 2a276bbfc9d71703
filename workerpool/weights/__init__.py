"""The weight files' life: ``convert`` writes them, ``publish`` deploys them, ``reload`` tells
when the served file changed and whether a new one may be served; ``npy`` reads array headers.
"""
