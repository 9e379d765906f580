"""KV between workers: the prefill side's pushes and pool writes, the decode side's
reservations, landing and push checking, host staging."""
