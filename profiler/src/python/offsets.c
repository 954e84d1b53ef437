#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#else
#include <frameobject.h>
#endif
#if PY_VERSION_HEX >= 0x030D0000
#define FRAME_CODE f_executable
#define INSTR instr_ptr
#else
#define FRAME_CODE f_code
#define INSTR prev_instr
#endif
#define P(name, expr) printf("%s %zu\n", name, (size_t)(expr))
int main(void) {
    P("runtime_interpreters", offsetof(_PyRuntimeState, interpreters.head));
    P("tstate_next", offsetof(PyThreadState, next));
#if PY_VERSION_HEX >= 0x030B0000
    P("interp_threads", offsetof(PyInterpreterState, threads.head));
    P("tstate_native_id", offsetof(PyThreadState, native_thread_id));
#if PY_VERSION_HEX >= 0x030D0000
    P("tstate_frame", offsetof(PyThreadState, current_frame));
#else
    P("tstate_frame", offsetof(PyThreadState, cframe));
    P("cframe_frame", offsetof(_PyCFrame, current_frame));
#endif
    P("frame_code", offsetof(_PyInterpreterFrame, FRAME_CODE));
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_instr", offsetof(_PyInterpreterFrame, INSTR));
#if PY_VERSION_HEX >= 0x030C0000
    P("frame_marker", offsetof(_PyInterpreterFrame, owner));
#else
    P("frame_marker", offsetof(_PyInterpreterFrame, is_entry));
#endif
    P("qualname", offsetof(PyCodeObject, co_qualname));
    P("bytecode", offsetof(PyCodeObject, co_code_adaptive));
#else
    P("interp_threads", offsetof(PyInterpreterState, tstate_head));
    P("tstate_native_id", offsetof(PyThreadState, thread_id));
    P("tstate_frame", offsetof(PyThreadState, frame));
    P("frame_code", offsetof(PyFrameObject, f_code));
    P("frame_previous", offsetof(PyFrameObject, f_back));
    P("frame_instr", offsetof(PyFrameObject, f_lasti));
    P("qualname", offsetof(PyCodeObject, co_name));
#endif
    P("filename", offsetof(PyCodeObject, co_filename));
    P("first_line", offsetof(PyCodeObject, co_firstlineno));
    P("line_table", offsetof(PyCodeObject, co_linetable));
    P("ascii_header", sizeof(PyASCIIObject));
    P("compact_header", sizeof(PyCompactUnicodeObject));
    return 0;
}
