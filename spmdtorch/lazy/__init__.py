"""The lazy engine: graph recording, graph keys, compile cache, execution, metrics."""
