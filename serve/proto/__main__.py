"""``python -m serve.proto``: regenerate the gRPC modules from ``decide.proto``."""

from serve.proto import generate

for path in generate():
    print(path)
