"""study moe: the IISWC sparse-vs-dense accuracy study on any MoE scenario and local data."""
