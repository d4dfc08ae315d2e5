"""SASS: disassembling a cubin with NVIDIA's nvdisasm, finding loops, counting instructions.

    functions = disassemble(cubin_path)          # {kernel name: Function}
    loop = hot_loop(functions['conv_igemm_fwd']) # None for straight-line kernels
    mix = instruction_mix(loop.instructions)     # {'ffma': 512, 'ldg': {...}, ...}

nvdisasm comes from the ``nvidia-cuda-nvdisasm`` wheel (the test extra) or a CUDA toolkit;
no GPU is needed. Loops are the natural loops of the control-flow graph (a branch back to a
block that dominates it); an iteration is counted statically, every instruction of the
loop's blocks once (both sides of a branch inside the body count, so a body with a rarely
taken path is over-counted; where the body is laid out contiguously this is the count from
the loop label to the back edge in the listing). A CALL counts as one instruction; the
callee (e.g. the 64-bit division subroutine) is not added.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque, namedtuple
from pathlib import Path

from . import elf

Instruction = namedtuple('Instruction', 'offset predicate opcode operands')
Loop = namedtuple('Loop', 'head tail instructions blocks')   # header offset, last back edge, body, block ids


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
    variable = 'GPUK_' + name.upper()
    override = os.environ.get(variable)
    if override:
        if not os.access(override, os.X_OK):
            raise ToolMissing('%s=%s is not an executable file' % (variable, override))
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


_LABEL_NUMBER = re.compile(r'\.L_x_(\d+)\b')
_ALIGNED_ANNOTATION = re.compile(r'[ \t]{2,}(?=\(\*)')


def canonical_listing(text):
    """``text`` with what depends on the rest of the file made local to it: nvdisasm's branch
    labels (.L_x_N) numbered in order of first appearance (nvdisasm numbers them in passes
    over the whole file, and numbers also go to labels it never prints), and the blank run
    that aligns annotations ((*"BRANCH_TARGETS ..."*), padded to the file's widest line)
    made one space. A cubin's listing alone and its part of a merged image's listing are then
    the same text."""
    numbers = {}
    text = _ALIGNED_ANNOTATION.sub(' ', text)
    return _LABEL_NUMBER.sub(lambda m: '.L_x_%d' % numbers.setdefault(m.group(1), len(numbers)), text)


def _run_nvdisasm(path, listing):
    """Starts nvdisasm -c on ``path`` writing to the open file ``listing`` (a file, not a pipe:
    several run at once)."""
    return subprocess.Popen([find_tool('nvdisasm'), '-c', str(path)], stdout=listing, stderr=subprocess.PIPE,
                            text=True)


def disassemble_text(cubin_path):
    """nvdisasm's listing (code sections only) of a cubin, labels renumbered (canonical_listing)."""
    result = subprocess.run([find_tool('nvdisasm'), '-c', str(cubin_path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError('nvdisasm failed on %s: %s' % (cubin_path, result.stderr.strip()))
    return canonical_listing(result.stdout)


_CODE_BLOCK = re.compile(r'^(//-+) (\.text\.\S+?)\s*(-+)$', re.M)
_SYMBOLS_BLOCK = re.compile(r'^//-+ SYMBOLS -+$', re.M)


def split_listing(text, cubin_sections):
    """Per-cubin listings from nvdisasm's listing of an elf.merge image: ``cubin_sections``,
    the code section names of each merged cubin in order. Each gets the listing's preamble
    (.target, .elftype: the same for cubins of one kind), its own code sections and lines of
    the closing SYMBOLS block, the merge's name mark removed (section headings padded again)
    and its labels renumbered: the text disassemble_text gives for that cubin alone.
    ValueError when the sections listed are not the ones expected."""
    symbols = _SYMBOLS_BLOCK.search(text)
    code_end = symbols.start() if symbols else len(text)
    found = list(_CODE_BLOCK.finditer(text, 0, code_end))
    expected = [(k, name) for k, names in enumerate(cubin_sections) for name in names]
    got = [match.group(2) for match in found]
    if got != [elf.CODE_PREFIX.decode() + elf.NAME_MARK % k + name[len(elf.CODE_PREFIX):] for k, name in expected]:
        raise ValueError('nvdisasm listed the code sections %s, expected %s' % (got[:5], expected[:5]))
    preamble = text[:found[0].start()] if found else text[:code_end]
    ends = [m.start() for m in found[1:]] + [code_end]
    symbol_lines = text[symbols.end():].splitlines(keepends=True) if symbols else []
    listings, first = [], 0
    for k, names in enumerate(cubin_sections):
        mark = elf.NAME_MARK % k
        blocks = []
        for match, end in zip(found[first:first + len(names)], ends[first:first + len(names)]):
            heading = '%s %-25s %s' % (match.group(1), match.group(2).replace(mark, ''), match.group(3))
            blocks.append(heading + text[match.end():end].replace(mark, ''))
        first += len(names)
        own = [line.replace(mark, '') for line in symbol_lines if mark in line]
        body = ''.join(blocks)
        if own:   # a SYMBOLS block follows the code after two blank lines, as between code sections
            body = body.rstrip('\n') + '\n\n\n' + ''.join([symbols.group(0), '\n\n'] + own)
        else:     # the listing ends with the last code line
            body = body.rstrip('\n') + '\n'
        listings.append(canonical_listing(preamble + body))
    return listings


def disassemble_texts(cubin_paths, processes=2):
    """disassemble_text of every cubin of ``cubin_paths``, in one nvdisasm run per architecture
    and share (elf.merge: nvdisasm's fixed start-up, about 0.2 CPU-seconds, is paid per run, not
    per cubin), ``processes`` runs at a time; the same texts as disassemble_text one by one.
    The next run starts as soon as one ends, before that one's listing is split: a core is not
    left idle while this process splits a listing (1 to 3 s for an architecture's share)."""
    find_tool('nvdisasm')   # ToolMissing before any work
    cubins = [Path(path).read_bytes() for path in cubin_paths]
    groups = {}
    for index, cubin in enumerate(cubins):
        groups.setdefault(elf.kind(cubin), []).append(index)
    batches = []   # about equal shares (by bytes) of each kind, one per process
    for members in groups.values():
        shares = [[] for _ in range(min(processes, len(members)))]
        for index in sorted(members, key=lambda i: -len(cubins[i])):
            min(shares, key=lambda share: sum(len(cubins[i]) for i in share)).append(index)
        batches.extend(sorted(share) for share in shares)
    listings = [None] * len(cubins)
    with tempfile.TemporaryDirectory(prefix='gpuk-nvdisasm-') as folder:
        def start(number):
            return (batches[number],) + _start_batch(folder, number, batches[number], cubins)
        running = deque(start(n) for n in range(min(processes, len(batches))))
        started = len(running)
        while running:
            batch, process, output = running.popleft()   # the oldest run: about the first to end
            raw = None
            if process is not None:
                process.communicate()
                output.seek(0)
                raw = output.read()
                output.close()
            if started < len(batches):
                running.append(start(started))
                started += 1
            texts = None if process is None else _batch_listings(process.returncode, raw, [cubins[i] for i in batch])
            for index, text in zip(batch, texts or [None] * len(batch)):
                listings[index] = text if text is not None else disassemble_text(cubin_paths[index])
    return listings


def _start_batch(folder, number, batch, cubins):
    """(nvdisasm process, its output file) of one batch's image; (None, None) when the cubins
    do not merge (an ELF layout elf.merge does not know: they are disassembled one by one)."""
    try:
        image_bytes = elf.merge([cubins[i] for i in batch]) if len(batch) > 1 else cubins[batch[0]]
    except ValueError:
        return None, None
    image = Path(folder) / ('batch%d.cubin' % number)
    image.write_bytes(image_bytes)
    output = open(Path(folder) / ('batch%d.sass' % number), 'w+')
    return _run_nvdisasm(image, output), output


def _batch_listings(returncode, text, cubins):
    """The per-cubin listings of one batch run; None when the run failed or its listing does
    not split as expected (the caller then disassembles those cubins one by one, so that an
    ELF layout the merge does not handle costs time, never a wrong listing)."""
    if returncode != 0:
        return None
    if len(cubins) == 1:
        return [canonical_listing(text)]
    try:
        return split_listing(text, [elf.code_sections(cubin) for cubin in cubins])
    except ValueError:
        return None


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


def _branch_target(function, instruction):
    match = _TARGET.search(instruction.operands)
    return function.labels.get(match.group(1)) if match else None


def _always(instruction):
    return instruction.predicate in (None, '@PT') and '.DIV' not in instruction.opcode


def control_flow_graph(function):
    """(blocks, successors, roots): basic blocks as (first, last) instruction indices, their
    successor block lists, and the entry blocks (the kernel's and each CALLed subroutine's)."""
    instructions = function.instructions
    index = {instruction.offset: i for i, instruction in enumerate(instructions)}
    leaders, calls = {0}, set()
    for i, instruction in enumerate(instructions):
        base = instruction.opcode.split('.')[0]
        if base in ('BRA', 'JMP', 'CALL'):
            target = _branch_target(function, instruction)
            if target in index:
                leaders.add(index[target])
                if base == 'CALL':
                    calls.add(index[target])
        if base in ('BRA', 'JMP', 'BRX', 'JMX', 'EXIT', 'RET', 'KILL') and i + 1 < len(instructions):
            leaders.add(i + 1)
    starts = sorted(leaders)
    blocks = [(first, (starts[k + 1] if k + 1 < len(starts) else len(instructions)) - 1)
              for k, first in enumerate(starts)]
    block_of = {first: k for k, (first, _) in enumerate(blocks)}
    successors = []
    for k, (_, last) in enumerate(blocks):
        instruction, base = instructions[last], instructions[last].opcode.split('.')[0]
        found = []
        if base in ('BRA', 'JMP'):
            target = _branch_target(function, instruction)
            if target in index:
                found.append(block_of[index[target]])
        ends = base in ('BRA', 'JMP', 'EXIT', 'RET', 'KILL') and _always(instruction)
        if not ends and k + 1 < len(blocks):
            found.append(k + 1)
        successors.append(found)
    roots = [0] + sorted(block_of[i] for i in calls if block_of[i] != 0)
    return blocks, successors, roots


def _postorder(successors, root):
    order, seen, stack = [], {root}, [(root, iter(successors[root]))]
    while stack:
        node, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            order.append(node)
        elif child not in seen:
            seen.add(child)
            stack.append((child, iter(successors[child])))
    return order


def _immediate_dominators(successors, root):
    """{block: immediate dominator} of the blocks reachable from root (Cooper, Harvey and
    Kennedy's iterative algorithm)."""
    order = _postorder(successors, root)
    number = {block: n for n, block in enumerate(order)}
    predecessors = {block: [] for block in order}
    for block in order:
        for successor in successors[block]:
            predecessors[successor].append(block)
    idom = {root: root}

    def intersect(a, b):
        while a != b:
            while number[a] < number[b]:
                a = idom[a]
            while number[b] < number[a]:
                b = idom[b]
        return a
    changed = True
    while changed:
        changed = False
        for block in reversed(order):
            if block == root:
                continue
            done = [p for p in predecessors[block] if p in idom]
            new = done[0]
            for p in done[1:]:
                new = intersect(p, new)
            if idom.get(block) != new:
                idom[block], changed = new, True
    return idom, predecessors


def loops(function):
    """Natural loops: for each back edge (a branch to a block that dominates it), the header
    and every block that reaches the branch without passing the header; back edges to one
    header make one loop. Instructions in address order; head/tail: the header's first
    instruction and the last back edge's offset. Code the compiler moved out of line and
    branched back from (a divergent-collective fallback after EXIT) is not a loop."""
    blocks, successors, roots = control_flow_graph(function)
    bodies, tails = {}, {}
    for root in roots:
        idom, predecessors = _immediate_dominators(successors, root)
        for block in idom:
            for header in successors[block]:
                walker = block
                while walker != header and idom[walker] != walker:
                    walker = idom[walker]
                if walker != header:
                    continue    # not dominated by the target: a jump back, not a loop
                body, work = bodies.setdefault(header, {header}), [block]
                while work:
                    node = work.pop()
                    if node not in body:
                        body.add(node)
                        work.extend(predecessors[node])
                tails[header] = max(tails.get(header, -1), function.instructions[blocks[block][1]].offset)
    instructions = function.instructions
    found = []
    for header, body in sorted(bodies.items()):
        members = [instructions[i] for b in sorted(body) for i in range(blocks[b][0], blocks[b][1] + 1)]
        found.append(Loop(instructions[blocks[header][0]].offset, tails[header], members, frozenset(body)))
    # a block branching to itself after the last EXIT is ptxas' trap, not a loop
    return [loop for loop in found if len(loop.instructions) > 1]


def innermost(found):
    """The loops that contain no other loop with useful math (a loop may hold small loops
    without math, such as a loader's per-row copies, and still be the innermost main loop)."""
    # once per loop: a kernel may have hundreds of loops, and the test below is over pairs
    has_math = [instruction_mix(loop.instructions)['math'] > 0 for loop in found]
    return [loop for i, loop in enumerate(found)
            if not any(j != i and other.blocks < loop.blocks and (has_math[j] or not has_math[i])
                       for j, other in enumerate(found))]


def hot_loop(function, found=None):
    """The innermost loop (see innermost) doing the most useful math, of those the shortest
    (a kernel with a fast and a general path of the same math: the fast one); without math,
    the one with the most global memory accesses, then the longest. None when the kernel has
    no loop. Without a profile, "hot" is this guess: the main loop of a kernel is where its
    math or its streaming happens. ``found``: loops(function), when the caller has them."""
    candidates = innermost(loops(function) if found is None else found)
    if not candidates:
        return None

    def weight(loop):
        mix = instruction_mix(loop.instructions)
        memory = sum(sum(mix[key].values()) for key in ('ldg', 'stg', 'ldgsts'))
        if mix['math']:
            return (mix['math'], -mix['total'], memory)
        return (0, memory, mix['total'])
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


_REGISTER = re.compile(r'\bR\d+\b')
_CATEGORY_OF_OPCODE = {}   # classify's answer depends on the opcode alone but for HFMA2


def _registers(operands):
    return _REGISTER.findall(operands)


def _category(instruction):
    """classify(instruction), remembered per opcode (a report classifies millions)."""
    category = _CATEGORY_OF_OPCODE.get(instruction.opcode)
    if category is None:
        category = classify(instruction)
        if not instruction.opcode.startswith('HFMA2'):
            _CATEGORY_OF_OPCODE[instruction.opcode] = category
    return category


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
        category = _category(instruction)
        if not from_integer and not instruction.opcode.startswith('I2F'):   # nothing to track (the
            registers = ()                                                  # common case: skip the regex)
        else:
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
