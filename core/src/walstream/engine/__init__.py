"""The engine: a node's lifecycle, the stream registry, the write and read paths, upload,
recovery and compaction."""
