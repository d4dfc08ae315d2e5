"""SASS: disassembling a cubin with NVIDIA's nvdisasm, finding loops, counting instructions.

    functions = disassemble(cubin_path)          # {kernel name: Function}
    loop = hot_loop(functions['conv_igemm_fwd']) # None for straight-line kernels
    mix = instruction_mix(loop.instructions)     # {'ffma': 512, 'ldg': {...}, ...}

nvdisasm comes from the ``nvidia-cuda-nvdisasm`` wheel (the test extra) or a CUDA toolkit;
no GPU is needed. A loop is a backward branch: the instructions from its target label to
the branch, counted statically (both sides of a branch inside the body count, so a body
with a rarely taken path is over-counted; the report says "per iteration" for this static
count, the same count as reading the listing from the loop label to the back edge).
"""
import os
import re
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

Instruction = namedtuple('Instruction', 'offset predicate opcode operands')
Loop = namedtuple('Loop', 'head tail instructions')   # offsets of the first and last instruction


class Function:
    """One kernel's disassembly: instructions in address order and label offsets."""

    def __init__(self, name, instructions, labels):
        self.name, self.instructions, self.labels = name, instructions, labels

    def __repr__(self):
        return 'Function(%r, %d instructions)' % (self.name, len(self.instructions))


class ToolMissing(RuntimeError):
    """nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)."""


def find_tool(name):
    """Path of an NVIDIA binary tool: $GPUK_<NAME>, the pip wheels' nvidia/*/bin, a CUDA toolkit, PATH."""
    override = os.environ.get('GPUK_' + name.upper())
    if override:
        return override
    for base in sys.path:
        for candidate in sorted(Path(base or '.').glob('nvidia/*/bin/' + name)):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    for home in (os.environ.get('CUDA_HOME'), os.environ.get('CUDA_PATH'), '/usr/local/cuda'):
        if home and os.access(os.path.join(home, 'bin', name), os.X_OK):
            return os.path.join(home, 'bin', name)
    found = shutil.which(name)
    if found:
        return found
    raise ToolMissing('%s not found: pip install nvidia-cuda-%s (the test extra) or set GPUK_%s'
                      % (name, name, name.upper()))


def disassemble_text(cubin_path):
    """nvdisasm's listing (code sections only) of a cubin."""
    result = subprocess.run([find_tool('nvdisasm'), '-c', str(cubin_path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError('nvdisasm failed on %s: %s' % (cubin_path, result.stderr.strip()))
    return result.stdout


_SECTION = re.compile(r'^\s*\.section\s+\.text\.([^,\s]+)')
_LABEL = re.compile(r'^\s*([.$\w]+):\s*$')
_INSTRUCTION = re.compile(r'^\s*/\*([0-9a-f]+)\*/\s+(?:(@!?U?P[T0-9]+)\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);')


def parse(text):
    """{function name: Function} from an nvdisasm listing; a label names the offset of the
    instruction after it."""
    functions, current, pending = {}, None, []
    for line in text.splitlines():
        match = _SECTION.match(line)
        if match:
            current, pending = Function(match.group(1), [], {}), []
            functions[current.name] = current
            continue
        if current is None:
            continue
        match = _INSTRUCTION.match(line)
        if match:
            offset, predicate, opcode, operands = match.groups()
            current.instructions.append(Instruction(int(offset, 16), predicate, opcode, operands.strip()))
            for name in pending:
                current.labels[name] = int(offset, 16)
            pending = []
            continue
        match = _LABEL.match(line)
        if match:
            pending.append(match.group(1))
    return functions


def disassemble(cubin_path):
    """{kernel name: Function} of a cubin."""
    return parse(disassemble_text(cubin_path))


_TARGET = re.compile(r'`\(([^)]+)\)')


def loops(function):
    """Loops of a function: one per backward-branch target, spanning to its last back edge."""
    tails = {}
    for instruction in function.instructions:
        if not instruction.opcode.startswith(('BRA', 'JMP')):
            continue
        match = _TARGET.search(instruction.operands)
        target = function.labels.get(match.group(1)) if match else None
        # a branch to itself is the trap ptxas puts after the last EXIT, not a loop
        if target is not None and target < instruction.offset:
            tails[target] = max(tails.get(target, target), instruction.offset)
    return [Loop(head, tail, [i for i in function.instructions if head <= i.offset <= tail])
            for head, tail in sorted(tails.items())]


def innermost(found):
    """The loops that contain no other loop."""
    return [loop for loop in found
            if not any(other is not loop and loop.head <= other.head and other.tail <= loop.tail
                       for other in found)]


def hot_loop(function):
    """The innermost loop doing the most useful math (then the most global memory accesses,
    then the longest); None when the kernel has no loop. Without a profile, "hot" is this
    guess: the main loop of a kernel is where its math or its streaming happens."""
    candidates = innermost(loops(function))
    if not candidates:
        return None

    def weight(loop):
        mix = instruction_mix(loop.instructions)
        return (mix['math'], sum(sum(mix[key].values()) for key in ('ldg', 'stg', 'ldgsts')),
                mix['total'])
    return max(candidates, key=weight)


# ---------------------------------------------------------------- classification

MMA_OPCODES = ('HMMA', 'IMMA', 'DMMA', 'BMMA', 'HGMMA', 'IGMMA', 'BGMMA', 'QGMMA')
WGMMA_OPCODES = ('HGMMA', 'IGMMA', 'BGMMA', 'QGMMA')
FP_MATH = ('FFMA', 'FFMA32I', 'FADD', 'FADD32I', 'FMUL', 'FMUL32I', 'HFMA2', 'HADD2', 'HMUL2',
           'DFMA', 'DADD', 'DMUL', 'MUFU')
INTEGER = ('IMAD', 'IMUL', 'IMUL32I', 'IADD', 'IADD3', 'IADD32I', 'VIADD', 'VIADDMNMX', 'LEA', 'ISETP',
           'SHF', 'SHL', 'SHR', 'LOP', 'LOP3', 'LOP32I', 'IABS', 'IMNMX', 'VIMNMX', 'SEL', 'PRMT', 'MOV',
           'MOV32I', 'CS2R', 'POPC', 'FLO', 'BREV', 'BMSK', 'SGXT', 'IDP', 'P2R', 'R2P', 'PLOP3',
           'S2R', 'S2UR', 'R2UR', 'UIADD3', 'UIMAD', 'ULEA', 'USHF', 'ULOP3', 'UMOV', 'USEL',
           'UISETP', 'UPRMT', 'UPOPC', 'UFLO', 'UBMSK', 'USGXT', 'UP2UR', 'UPLOP3', 'VOTEU')
CONVERSION = ('F2F', 'F2I', 'I2F', 'F2FP', 'I2FP', 'I2I', 'FRND')
FP_COMPARE = ('FSETP', 'FSEL', 'FMNMX', 'FCHK', 'DSETP', 'DMNMX', 'HSETP2', 'HMNMX2', 'FSET')
ASYNC_WAIT = ('DEPBAR', 'LDGDEPBAR', 'MEMBAR', 'ERRBAR', 'ARRIVES', 'SYNCS', 'CCTL', 'FENCE')
CONTROL = ('BRA', 'BRX', 'JMP', 'JMX', 'CALL', 'RET', 'EXIT', 'NOP', 'YIELD', 'BSSY', 'BSYNC',
           'WARPSYNC', 'BREAK', 'KILL')
_WIDTH = re.compile(r'^(?:U|S)?(8|16|32|64|128)$')


def access_bits(opcode):
    """Bits per thread of a load/store opcode: LDG.E.128 -> 128, LDS.U16 -> 16, LDG.E -> 32."""
    for part in opcode.split('.')[1:]:
        match = _WIDTH.match(part)
        if match:
            return int(match.group(1))
    return 32


def classify(instruction):
    """The mix category of one instruction (see instruction_mix)."""
    opcode, operands = instruction.opcode, instruction.operands
    base = opcode.split('.')[0]
    if base in MMA_OPCODES:
        return 'wgmma' if base in WGMMA_OPCODES else 'mma'
    if base == 'HFMA2' and '.MMA' in opcode and '-RZ, RZ' in operands:
        return 'int'        # ptxas' constant move on the FMA pipe: HFMA2.MMA Rd, -RZ, RZ, imm, imm
    if base == 'HADD2' and '.F32' in opcode:
        return 'conversion'   # half -> float
    if base == 'FFMA' or base == 'FFMA32I':
        return 'ffma'
    if base == 'HFMA2':
        return 'hfma2'
    if base == 'DFMA':
        return 'dfma'
    if base == 'MUFU':
        return 'mufu'
    if base in FP_COMPARE:
        return 'fp_compare'
    if base in ('DADD', 'DMUL'):
        return 'fp64_other'
    if base in FP_MATH:
        return 'fp_other'   # FADD/FMUL/HADD2/HMUL2
    if base == 'LDGSTS':
        return 'ldgsts'
    if base in ('LDG', 'STG', 'LDS', 'STS', 'LDSM', 'LDL', 'STL'):
        return {'LDL': 'local', 'STL': 'local'}.get(base, base.lower())
    if base in ('LD', 'ST'):
        return 'generic_mem'
    if base in ('ATOM', 'ATOMG', 'ATOMS', 'RED', 'REDG'):
        return 'atomic'
    if base == 'BAR':
        return 'bar'
    if base in ASYNC_WAIT:
        return 'async_wait'
    if base in ('SHFL', 'VOTE', 'MATCH', 'REDUX'):
        return 'warp'
    if base in INTEGER or (base.startswith('U') and base not in ('ULDC',)):
        return 'int'
    if base in ('LDC', 'ULDC'):
        return 'const'
    if base in CONVERSION:
        return 'conversion'
    if base in CONTROL:
        return 'control'
    return 'other'


SIZED = ('ldg', 'stg', 'ldgsts', 'lds', 'sts')     # counted per access width
COUNTED = ('ffma', 'hfma2', 'dfma', 'fp_other', 'fp64_other', 'mufu', 'mma', 'wgmma', 'fp_compare', 'ldsm',
           'local', 'generic_mem', 'atomic', 'bar', 'async_wait', 'warp', 'int', 'const', 'conversion',
           'control', 'other')
USEFUL_MATH = ('ffma', 'hfma2', 'dfma', 'fp_other', 'fp64_other', 'mufu', 'mma', 'wgmma')


def _registers(operands):
    return re.findall(r'\bR\d+\b', operands)


def instruction_mix(instructions):
    """Counts by category; ldg/stg/lds/sts as {bits per thread: count}; 'math' = useful math
    (FP arithmetic, MUFU, tensor-core MMAs), 'total' = every instruction.

    Integer division and modulo compile to I2F.RP -> MUFU.RCP -> F2I -> IMAD fix-ups: a
    MUFU.RCP of a register an I2F.*.RP wrote is address arithmetic, counted as 'int', not math.
    """
    mix = {key: 0 for key in COUNTED}
    mix.update({key: {} for key in SIZED})
    from_integer = set()   # registers last written by an I2F.*.RP
    for instruction in instructions:
        category = classify(instruction)
        registers = _registers(instruction.operands)
        if instruction.opcode.startswith('I2F') and '.RP' in instruction.opcode and registers:
            from_integer.add(registers[0])
        elif category == 'mufu' and instruction.opcode == 'MUFU.RCP' and registers[1:2] \
                and registers[1] in from_integer:
            category = 'int'
        elif registers and registers[0] in from_integer and category != 'mufu':
            from_integer.discard(registers[0])
        if category in SIZED:
            bits = access_bits(instruction.opcode)
            mix[category][bits] = mix[category].get(bits, 0) + 1
        else:
            mix[category] += 1
    mix['math'] = sum(mix[key] for key in USEFUL_MATH)
    mix['total'] = len(instructions)
    return mix


def opcode_counts(instructions):
    """{full opcode: count}, for hand checks (python -m gpuk.kernels.inspect --dump-loop)."""
    counts = {}
    for instruction in instructions:
        counts[instruction.opcode] = counts.get(instruction.opcode, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
