"""Running a cluster: its description (``spec``), each process's command (``plan``) and
where it runs (``host``), the one child-process wrapper (``processes``) and its uses for
Redis (``redis``) and the KV pool's services (``pool``), network hosts (``netns``),
starting and stopping it (``launch``, ``up``), health probes (``probe``) and fault
injection (``faults``)."""
