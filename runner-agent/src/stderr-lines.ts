/** The most lines one folded object may span; a longer block is passed on line by line. */
const FOLD_MAX_LINES = 200;

/** Opening minus closing brackets on a line, quoted text left out (Node's inspect quotes with '). */
function depthChange(line: string): number {
  let depth = 0;
  const bare = line.replace(/'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|`(?:[^`\\]|\\.)*`/g, '');
  for (const ch of bare) {
    if (ch === '{' || ch === '[') depth++;
    else if (ch === '}' || ch === ']') depth--;
  }
  return depth;
}

/**
 * The lines of one stderr chunk, with each object a runtime dumped across many lines
 * (`console.error('Error handling request', request, error)` prints Node's multi-line inspect
 * output) folded into one line, its indentation collapsed: a person reads one line, not
 * thirteen events. A block folds when a line opens a bracket it does not close and the
 * brackets balance again within the same chunk (a dump is written at once) and within
 * FOLD_MAX_LINES; anything else is passed on as it came, so no text is held back or lost.
 */
export function foldDumpedObjects(lines: string[]): string[] {
  const out: string[] = [];
  let i = 0;
  while (i < lines.length) {
    const first = lines[i] as string;
    let depth = depthChange(first);
    if (depth <= 0 || !/[{[]\s*$/.test(first)) {
      out.push(first);
      i++;
      continue;
    }
    let end = i + 1;
    while (end < lines.length && end - i < FOLD_MAX_LINES && depth > 0) depth += depthChange(lines[end++] as string);
    if (depth !== 0) {
      out.push(first);
      i++;
      continue;
    }
    out.push(
      lines
        .slice(i, end)
        .map((l) => l.trim())
        .join(' '),
    );
    i = end;
  }
  return out;
}
