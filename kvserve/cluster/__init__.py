"""Running a cluster: its description (``spec``), each process's command (``plan``), the
processes themselves (``processes``, ``redis``), network hosts (``netns``), starting and
stopping it (``launch``, ``up``), health probes (``probe``) and fault injection (``faults``)."""
