/**
 * The seccomp filter a sandbox's processes run under (bubblewrap's `--seccomp`): a classic BPF
 * program, as the kernel takes it, that refuses the system calls a coding agent has no use for
 * and that reach past its namespaces: the kernel's keyrings (not namespaced), eBPF, perf events,
 * userfaultfd, io_uring, kernel modules and kexec, mounts and namespace changes, the clock,
 * swap, reboot, quotas, file handles, the kernel log, and pushing input into a terminal
 * (TIOCSTI, TIOCLINUX). A call of another architecture's ABI (32-bit, x32) kills the process,
 * so that no numbering other than the one checked gets through. Everything else is allowed:
 * the namespaces, no capabilities and `no_new_privs` do the rest.
 */

/** `struct sock_filter` op codes. */
const LD_W_ABS = 0x20;
const JEQ_K = 0x15;
const JGE_K = 0x35;
const RET_K = 0x06;

const RET_KILL_PROCESS = 0x80000000;
const RET_ERRNO = 0x00050000;
const RET_ALLOW = 0x7fff0000;
const EPERM = 1;
const ENOSYS = 38;

/** Offsets in `struct seccomp_data`: nr, arch, then args[6] of 8 bytes each from 16. */
const NR = 0;
const ARCH = 4;
const ARG1_LOW = 24;

const TIOCSTI = 0x5412;
const TIOCLINUX = 0x541c;

/** The x32 ABI's calls on x86_64 carry this bit in their number. */
const X32_SYSCALL_BIT = 0x40000000;

interface Abi {
  /** AUDIT_ARCH_* of the architecture. */
  arch: number;
  ioctl: number;
  /** Refused with ENOSYS, so that a library falls back as on a kernel without them. */
  absent: number[];
  /** Refused with EPERM. */
  refused: number[];
  /** Numbers from this one up belong to another ABI. */
  foreignFrom?: number;
}

// io_uring_setup, io_uring_enter, io_uring_register have the same numbers on both.
const IO_URING = [425, 426, 427];

const ABIS: Partial<Record<NodeJS.Architecture, Abi>> = {
  x64: {
    arch: 0xc000003e,
    ioctl: 16,
    absent: IO_URING,
    refused: [
      103, // syslog
      134, // uselib
      153, // vhangup
      154, // modify_ldt
      155, // pivot_root
      156, // _sysctl
      159, // adjtimex
      163, // acct
      164, // settimeofday
      165, // mount
      166, // umount2
      167, // swapon
      168, // swapoff
      169, // reboot
      170, // sethostname
      171, // setdomainname
      172, // iopl
      173, // ioperm
      174, // create_module
      175, // init_module
      176, // delete_module
      177, // get_kernel_syms
      178, // query_module
      179, // quotactl
      180, // nfsservctl
      212, // lookup_dcookie
      227, // clock_settime
      246, // kexec_load
      248, // add_key
      249, // request_key
      250, // keyctl
      272, // unshare
      298, // perf_event_open
      303, // name_to_handle_at
      304, // open_by_handle_at
      305, // clock_adjtime
      308, // setns
      313, // finit_module
      320, // kexec_file_load
      321, // bpf
      323, // userfaultfd
      428, // open_tree
      429, // move_mount
      430, // fsopen
      431, // fsconfig
      432, // fsmount
      433, // fspick
      442, // mount_setattr
      443, // quotactl_fd
    ],
    foreignFrom: X32_SYSCALL_BIT,
  },
  arm64: {
    arch: 0xc00000b7,
    ioctl: 29,
    absent: IO_URING,
    refused: [
      18, // lookup_dcookie
      39, // umount2
      40, // mount
      41, // pivot_root
      58, // vhangup
      60, // quotactl
      89, // acct
      97, // unshare
      104, // kexec_load
      105, // init_module
      106, // delete_module
      112, // clock_settime
      116, // syslog
      142, // reboot
      161, // sethostname
      162, // setdomainname
      170, // settimeofday
      171, // adjtimex
      217, // add_key
      218, // request_key
      219, // keyctl
      224, // swapon
      225, // swapoff
      241, // perf_event_open
      264, // name_to_handle_at
      265, // open_by_handle_at
      266, // clock_adjtime
      268, // setns
      273, // finit_module
      280, // bpf
      282, // userfaultfd
      294, // kexec_file_load
      428, // open_tree
      429, // move_mount
      430, // fsopen
      431, // fsconfig
      432, // fsmount
      433, // fspick
      442, // mount_setattr
      443, // quotactl_fd
    ],
  },
};

/**
 * The filter for this machine's architecture as `struct sock_filter` bytes (little-endian, as both architectures are),
 * or undefined on an architecture it does not know (sandboxes then run without one, and the
 * isolation line says so).
 */
export function seccompProgram(arch: NodeJS.Architecture = process.arch): Buffer | undefined {
  const abi = ABIS[arch];
  if (!abi) return undefined;
  const ops: [code: number, jt: number, jf: number, k: number][] = [
    [LD_W_ABS, 0, 0, ARCH],
    [JEQ_K, 1, 0, abi.arch],
    [RET_K, 0, 0, RET_KILL_PROCESS],
    [LD_W_ABS, 0, 0, NR],
  ];
  if (abi.foreignFrom !== undefined) ops.push([JGE_K, 0, 1, abi.foreignFrom], [RET_K, 0, 0, RET_KILL_PROCESS]);
  for (const [errno, calls] of [
    [ENOSYS, abi.absent],
    [EPERM, abi.refused],
  ] as const) {
    for (const nr of calls) ops.push([JEQ_K, 0, 1, nr], [RET_K, 0, 0, RET_ERRNO | errno]);
  }
  // ioctl: only the two requests that type into a terminal are refused.
  ops.push(
    [JEQ_K, 0, 4, abi.ioctl],
    [LD_W_ABS, 0, 0, ARG1_LOW],
    [JEQ_K, 1, 0, TIOCSTI],
    [JEQ_K, 0, 1, TIOCLINUX],
    [RET_K, 0, 0, RET_ERRNO | EPERM],
    [RET_K, 0, 0, RET_ALLOW],
  );
  const program = Buffer.alloc(ops.length * 8);
  ops.forEach(([code, jt, jf, k], i) => {
    program.writeUInt16LE(code, i * 8);
    program.writeUInt8(jt, i * 8 + 2);
    program.writeUInt8(jf, i * 8 + 3);
    program.writeUInt32LE(k >>> 0, i * 8 + 4);
  });
  return program;
}
