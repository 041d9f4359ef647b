"""The plan language: YAML text -> a validated, expanded Plan (planner.ir).

yamlsrc (YAML with source locations) -> document (the pydantic schema of a plan file)
-> expand (blocks, loops, templates) -> loader (params, dims, shapes, gates: a Plan).
"""
