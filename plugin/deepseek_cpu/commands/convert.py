"""`deepseek-cpu convert`: a Hugging Face checkpoint to a GGUF, quantized or not."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ..errors import DeepseekCpuError
from ..hookspecs import hookimpl
from ..quantization import types as quant_types
from .options import SchemeName


@click.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--outtype", type=click.Choice(quant_types.DIRECT), default=None,
              help="Type of the weight matrices, written by the converter itself (norms and the router stay "
                   "f32). [default: bf16]")
@click.option("--quant", type=SchemeName(), default=None,
              help="Or any quantization scheme (`deepseek-cpu schemes`): converted to a bf16 intermediate, "
                   "quantized by llama.cpp, the intermediate deleted.")
@click.option("--imatrix", type=click.Path(path_type=Path), default=None,
              help="Importance matrix for --quant (`deepseek-cpu imatrix`).")
@click.option("--tensor-type", "tensor_types", multiple=True, metavar="PATTERN=TYPE",
              help="Per-tensor override for --quant (as in `deepseek-cpu quantize`; repeatable).")
@click.option("--name", default=None, help="general.name in the GGUF (default: config's _name_or_path, "
              "else the directory name).")
@click.option("--no-mtp", "no_mtp", is_flag=True,
              help="Leave out the multi-token-prediction (MTP) layer of V3/R1/V3.1/V3.2/V4 (kept by default: "
                   "the draft head for speculative decoding).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def convert(checkpoint, out, outtype, quant, imatrix, tensor_types, name, no_mtp, quiet):
    """Convert a Hugging Face CHECKPOINT directory (DeepSeek-V2/V3 family) to OUT.gguf."""
    from ..quantization.quantize import convert_quantized
    if outtype and quant:
        raise click.UsageError("give --outtype or --quant, not both")
    if (imatrix or tensor_types) and not quant:
        raise click.UsageError("--imatrix and --tensor-type go with --quant")
    outtype = quant or outtype or "bf16"
    t0 = time.time()
    try:
        path = convert_quantized(checkpoint, out, outtype, imatrix=imatrix, tensor_types=tensor_types,
                                 progress=not quiet, name=name, mtp=not no_mtp)
    except OSError as e:  # e.g. a shard that cannot be read: the user's file, not a bug of ours
        if isinstance(e, DeepseekCpuError):  # MissingShard, MissingTokenizer: left to cli._Group.invoke
            raise
        raise click.ClickException(f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}") from None
    except KeyboardInterrupt:
        click.echo("interrupted; nothing was written", err=True)
        sys.exit(130)
    from ..quantization.quantize import written_types
    bpw, _types = written_types(path)  # an AWQ/GPTQ import keeps INT4 blocks whatever the outtype
    click.echo(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, {outtype}, {bpw:.2f} bits/weight) "
               f"in {time.time() - t0:.1f} s")



@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(convert)
