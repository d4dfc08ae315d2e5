"""Cubins as ELF files: their sections, and many cubins merged into one image for nvdisasm.

nvdisasm reads one file per run and spends about 0.2 CPU-seconds setting up for the target
architecture before it reads any code; the report disassembles about a hundred cubins, so
it merges the cubins of one architecture into one ELF image (``merge``), disassembles that
once, and splits the listing back per cubin (sass.disassemble_texts).

The merged image holds every section of every cubin, in cubin order, except their section
name, symbol and string tables, which become one of each: the symbols of cubin k keep their
order and move up by the number of symbols before them; each reference to a symbol or a
section is renumbered (section headers' link and info fields, relocations, the symbol
indices in .nv.info attributes and in .nv.callgraph). Names are made unique by putting
``NAME_MARK % k`` in front of every symbol name of cubin k and of the function name in its
per-function section names (.text.<function>, .nv.info.<function>, .nv.constant2.<function>,
...): nvdisasm would otherwise rename duplicates its own way (.text.f__1);
sass.split_listing removes the mark.
The layout of .nv.info follows the public descriptions of the CUDA ELF format (e.g. the
cuobjdump/nvdisasm documentation and open-source cubin parsers): 4-byte attribute headers
(format, attribute, 16-bit size or value), a payload only in format EIFMT_SVAL.
"""
import struct

ELF_HEADER = struct.Struct('<16sHHIQQQIHHHHHH')   # ELF64, little-endian
SECTION_HEADER = struct.Struct('<IIQQQQIIQQ')
SYMBOL = struct.Struct('<IBBHQQ')
REL, RELA = struct.Struct('<QQ'), struct.Struct('<QQq')
SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 2, 3, 4, 8, 9
SHT_NV_INFO, SHT_NV_CALLGRAPH = 0x70000000, 0x70000001
SHF_INFO_LINK = 0x40          # sh_info holds a section index
SHN_LORESERVE = 0xff00        # symbol section indices from here on are special (absolute, common)
SPECIAL_SYMBOL = 0xffff0000   # .nv.callgraph markers (-1, -2, ...) are no symbol indices
EIFMT_SVAL = 0x04
# .nv.info attributes whose payload starts with a symbol index: PARAM_CBANK, FRAME_SIZE,
# MIN_STACK_SIZE, MAX_STACK_SIZE, REGCOUNT; EXTERNS is a list of symbol indices.
SYMBOL_ATTRIBUTES = {0x0a, 0x11, 0x12, 0x23, 0x2f}
SYMBOL_LIST_ATTRIBUTES = {0x0f}
STT_FUNC, STT_SECTION = 2, 3
NAME_MARK = 'gpukb%d_'
CODE_PREFIX = b'.text.'


class Section:
    """One section: its name, header fields (a list in SECTION_HEADER order) and contents."""

    def __init__(self, name, header, data):
        self.name, self.header, self.data = name, header, data

    @property
    def kind(self):
        return self.header[1]


def read(elf):
    """(ELF header fields, [Section]) of a 64-bit little-endian ELF (a cubin)."""
    if elf[:4] != b'\x7fELF' or elf[4] != 2 or elf[5] != 1:
        raise ValueError('not a 64-bit little-endian ELF cubin')
    header = ELF_HEADER.unpack_from(elf, 0)
    offset, entry_size, count, names_index = header[6], header[11], header[12], header[13]
    headers = [list(SECTION_HEADER.unpack_from(elf, offset + i * entry_size)) for i in range(count)]
    names = elf[headers[names_index][4]:headers[names_index][4] + headers[names_index][5]]
    sections = []
    for fields in headers:
        name = names[fields[0]:names.index(b'\0', fields[0])]
        data = b'' if fields[1] == SHT_NOBITS else elf[fields[4]:fields[4] + fields[5]]
        sections.append(Section(name, fields, data))
    return header, sections


def sections(elf):
    """{section name: bytes} of a cubin."""
    return {section.name.decode(): section.data for section in read(elf)[1]}


def code_sections(elf):
    """Names of the cubin's code sections (.text.<function>), in file order: nvdisasm lists them so."""
    return [s.name.decode() for s in read(elf)[1] if s.name.startswith(CODE_PREFIX)]


def kind(cubin):
    """What must agree for cubins to share one merged image (whose listing has one preamble):
    ELF class, type, machine and flags, and the module-wide target descriptions (the notes and
    .nv.compat: sm_90a and sm_90 cubins differ only there)."""
    header, own = read(cubin)
    described = tuple((s.name, s.data) for s in own if s.name.startswith(b'.note.') or s.name == b'.nv.compat')
    return (header[0][:8], header[1], header[2], header[7]) + described


def _marked(name, mark, functions, section=True):
    """``name`` with ``mark`` in front of the function name in it: a per-function section or
    its section symbol (.text.f, .nv.info.f, .nv.constant2.f, ...: a name ending in '.' + a
    function of the cubin) -> .text.<mark>f; a module-wide section (.nv.info, .nv.constant4,
    ...) keeps its name; any other symbol s -> <mark>s."""
    if not section:
        return mark + name
    for function in functions:   # longest first: .text.f_g is f_g's, not g's
        if name.endswith(b'.' + function):
            return name[:len(name) - len(function)] + mark + function
    return name


def _renumber_info(data, symbol):
    data = bytearray(data)
    position = 0
    while position + 4 <= len(data):
        fmt, attribute, size = data[position], data[position + 1], struct.unpack_from('<H', data, position + 2)[0]
        if fmt != EIFMT_SVAL:      # the 16 bits are the value itself
            position += 4
            continue
        words = range(position + 4, position + 4 + size - size % 4, 4)
        if attribute in SYMBOL_ATTRIBUTES and size >= 4:
            words = words[:1]
        elif attribute not in SYMBOL_LIST_ATTRIBUTES:
            words = ()
        for word in words:
            struct.pack_into('<I', data, word, symbol(struct.unpack_from('<I', data, word)[0]))
        position += 4 + size
    return bytes(data)


def _renumber_relocations(data, layout, symbol):
    data = bytearray(data)
    for offset in range(0, len(data) - layout.size + 1, layout.size):
        fields = list(layout.unpack_from(data, offset))
        fields[1] = (symbol(fields[1] >> 32) << 32) | (fields[1] & 0xffffffff)
        layout.pack_into(data, offset, *fields)
    return bytes(data)


def merge(cubins):
    """One ELF image holding every cubin of ``cubins`` (bytes, all of one ``kind``), for
    nvdisasm; cubin k's names carry NAME_MARK % k."""
    first = None
    merged = [Section(b'', [0] * 10, b'')]
    symbols, strings = bytearray(SYMBOL.size), bytearray(b'\0')
    for number, elf in enumerate(cubins):
        header, own = read(elf)
        if first is None:
            first = header
        elif kind(elf) != kind(cubins[0]):
            raise ValueError('elf.merge: cubin %d is for another architecture or ELF kind than cubin 0' % number)
        mark = (NAME_MARK % number).encode()
        tables = [i for i, s in enumerate(own) if s.kind == SHT_SYMTAB]
        if len(tables) != 1:
            raise ValueError('elf.merge: cubin %d has %d symbol tables, expected 1' % (number, len(tables)))
        symtab = tables[0]
        strtab, shstrtab = own[symtab].header[6], header[13]
        new_index = {}
        for i in range(1, len(own)):
            if i not in (symtab, strtab, shstrtab):
                new_index[i] = len(merged) + len(new_index)
        symbol_base = len(symbols) // SYMBOL.size - 1
        names = own[strtab].data
        entries = [list(SYMBOL.unpack_from(own[symtab].data, offset))
                   for offset in range(SYMBOL.size, len(own[symtab].data), SYMBOL.size)]
        functions = sorted((names[e[0]:names.index(b'\0', e[0])] for e in entries if e[1] & 0xf == STT_FUNC),
                           key=len, reverse=True)
        for fields in entries:
            if fields[0]:   # a fresh string each: string tables share tails between names
                name = names[fields[0]:names.index(b'\0', fields[0])]
                fields[0] = len(strings)
                strings.extend(_marked(name, mark, functions, fields[1] & 0xf == STT_SECTION) + b'\0')
            if 0 < fields[3] < SHN_LORESERVE:
                fields[3] = new_index[fields[3]]
            symbols.extend(SYMBOL.pack(*fields))

        def symbol(index, base=symbol_base):
            return index + base if 0 < index < SPECIAL_SYMBOL else index

        def section(index):
            return {symtab: 'symtab', strtab: 'strtab'}.get(index) or new_index[index]
        for i, s in enumerate(own):
            if i not in new_index:
                continue
            fields, data = list(s.header), s.data
            if fields[6]:
                fields[6] = section(fields[6])
            if fields[7] and (s.kind in (SHT_REL, SHT_RELA) or fields[2] & SHF_INFO_LINK):
                fields[7] = section(fields[7])
            if s.name.startswith(CODE_PREFIX):   # sh_info: registers << 24 | the function's symbol
                fields[7] = (fields[7] & 0xff000000) | symbol(fields[7] & 0xffffff)
            if s.kind == SHT_REL:
                data = _renumber_relocations(data, REL, symbol)
            elif s.kind == SHT_RELA:
                data = _renumber_relocations(data, RELA, symbol)
            elif s.kind == SHT_NV_INFO:
                data = _renumber_info(data, symbol)
            elif s.kind == SHT_NV_CALLGRAPH:
                words = struct.unpack('<%dI' % (len(data) // 4), data)
                data = struct.pack('<%dI' % len(words), *map(symbol, words))
            merged.append(Section(_marked(s.name, mark, functions), fields, data))
    symtab_index, strtab_index = len(merged), len(merged) + 1
    for s in merged:
        s.header[6] = {'symtab': symtab_index, 'strtab': strtab_index}.get(s.header[6], s.header[6])
        s.header[7] = {'symtab': symtab_index, 'strtab': strtab_index}.get(s.header[7], s.header[7])
    merged.append(Section(b'.symtab', [0, SHT_SYMTAB, 0, 0, 0, len(symbols), strtab_index,
                                       len(symbols) // SYMBOL.size, 8, SYMBOL.size], bytes(symbols)))
    merged.append(Section(b'.strtab', [0, SHT_STRTAB, 0, 0, 0, len(strings), 0, 0, 1, 0], bytes(strings)))
    merged.append(Section(b'.shstrtab', [0, SHT_STRTAB, 0, 0, 0, 0, 0, 0, 1, 0], b''))
    return _write(first, merged)


def _write(header, merged):
    """The ELF bytes: header, section contents (aligned as their headers ask), section headers;
    no program headers (nvdisasm does not need them). The last section is the name table."""
    table, offsets = bytearray(b'\0'), {}
    for s in merged[1:]:
        if s.name not in offsets:
            offsets[s.name] = len(table)
            table.extend(s.name + b'\0')
    merged[-1].data, merged[-1].header[5] = bytes(table), len(table)
    out = bytearray(ELF_HEADER.size)
    headers = [merged[0].header]
    for s in merged[1:]:
        fields = list(s.header)
        fields[0] = offsets[s.name]
        out.extend(b'\0' * (-len(out) % max(fields[8], 1)))
        fields[4] = len(out)
        if s.kind != SHT_NOBITS:
            out.extend(s.data)
        headers.append(fields)
    out.extend(b'\0' * (-len(out) % 8))
    fields = list(header)
    fields[5], fields[6], fields[10], fields[12], fields[13] = 0, len(out), 0, len(headers), len(headers) - 1
    for section_header in headers:
        out.extend(SECTION_HEADER.pack(*section_header))
    ELF_HEADER.pack_into(out, 0, *fields)
    return bytes(out)
