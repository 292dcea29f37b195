"""load_pretrained / save_pretrained on 2 processes x 4 CPU devices (run by test_hf_multiprocess.py).

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 tests/checkpoint/hf_two_process_job.py SRC OUT SIZE

Every process loads the Hugging Face directory ``SRC`` FSDP-sharded over all
8 devices, checks that each of its own devices' blocks equals that slice of
the CPU model transformers loads, compares logits, and saves to ``OUT``
(process 0 writes). Prints ``RESULT {...}``.
"""

from __future__ import annotations

import json
import sys

if __name__ == "__main__":
    import spmdtorch.runtime as xr

    xr.initialize_distributed()
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from spmdtorch.checkpoint import load_pretrained, save_pretrained
    from spmdtorch.mesh import Mesh

    src, out, size = sys.argv[1:4]
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
    load_pretrained(src, model, mesh, "fsdp")
    ref = AutoModelForCausalLM.from_pretrained(src)
    blocks_equal, local_blocks = True, 0
    for name, p in model.named_parameters():
        full = ref.get_parameter(name).detach().numpy()
        for shard in p._st.value.addressable_shards:  # this process's devices only
            blocks_equal &= bool(np.array_equal(np.asarray(shard.data), full[shard.index]))
            local_blocks += 1
    ids = torch.randint(0, ref.config.vocab_size, (8, 8), generator=torch.Generator().manual_seed(0))
    logits_diff = (model(ids.to("xla")).logits.cpu() - ref(ids).logits).abs().max().item()
    save_pretrained(model, out, max_shard_size=size)
    result = {
        "process_index": xr.process_index(),
        "process_count": xr.process_count(),
        "blocks_equal": blocks_equal,
        "local_blocks": local_blocks,
        "n_params": len(list(model.parameters())),
        "logits_diff": logits_diff,
    }
    print("RESULT " + json.dumps(result), flush=True)
