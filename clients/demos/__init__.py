"""``lowtide demo``: generated, disordered links through the dissertation's queries, in this
process (``in_process``), through a server (``server``) or fed by Spark (``spark``)."""
