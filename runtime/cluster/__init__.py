"""Scale-out on established engines: `braid serve --dp N` runs engine replicas behind
SGLang's router with braid's front before it (serve.py, front.py), and prefix affinity
(affinity.py) places requests where braid routes by itself (RayBackend's actors, the
requests the front sends to replicas directly). Everything here is imported on use only."""
