/* A piece of a Kineto trace's `traceEvents` text straight into columns, in one pass, with no
 * Python object made per event: the optional compiled path of
 * fsdp_trace.analysis.read.columns.Columns.add_text.
 *
 * It reads only what the msgspec structs of fsdp_trace.analysis.read.events read, and gives
 * exactly what Columns.add makes of them. It takes the plain case only: a piece holding
 * anything else (a value of an unexpected type, an integer beyond int64, a string pid of a
 * complete event, a key written with escapes, a key given twice, nesting deeper than
 * MAX_DEPTH, text that is not JSON) is refused whole (`parse` returns None) and left to the
 * msgspec path, which reads it as it always has, errors and notices included. So this file
 * decides nothing about bad input: it only declines it.
 *
 * Written for this project (CPython's C API only, no numpy headers): the arrays go back as
 * bytes objects that numpy reads without a copy.
 *
 * The scan of a piece runs with the GIL released, so that a second reader reads the next piece
 * on another thread (columns.SecondReader) while the file is read and gunzipped on a third.
 * It makes no Python object: a metadata event's strings are kept as bytes and made into
 * objects after it, the GIL held again (and taken back for the rare number only CPython's
 * dtoa converts). One reader serves one call at a time (its tables are not shared); a
 * second thread's call on a busy reader is refused.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_NUMBER 100 /* characters of a number read here; longer ones are declined */
#define MISSING (-1)

typedef unsigned char uchar;

#include "_fastread_json.c" /* buffers, intern tables, the JSON scanner */

/* ------------------------------------------------------------------ one event */

/* The args fields read, in the order of columns._DENSE_ARGS and columns._RARE. */
enum { A_CORRELATION, A_EXTERNAL_ID, A_SEQUENCE_NUMBER, A_STREAM, N_DENSE };
enum {
    R_COLLECTIVE_NAME,
    R_DTYPE,
    R_IN_NELEMS,
    R_OUT_NELEMS,
    R_GROUP_SIZE,
    R_PG_NAME,
    R_PG_DESC,
    R_PG_RANKS,
    R_SEQ,
    R_GRID,
    R_BLOCK,
    N_RARE
};
enum { K_TEXT, K_INT, K_RAW }; /* a rare field's kind */
static const int RARE_KIND[N_RARE] = {K_TEXT, K_TEXT, K_INT, K_INT, K_INT, K_TEXT,
                                      K_TEXT, K_TEXT, K_INT, K_RAW, K_RAW};

typedef struct {
    int present; /* 0 absent/null (None) */
    int64_t i;   /* K_INT */
    int32_t id;  /* K_TEXT: text table id; K_RAW: raw table id */
} RareValue;

typedef struct {
    const uchar *p;
    size_t n;
} Span;

typedef enum { ID_ABSENT, ID_INT, ID_STR } IdKind;

typedef struct {
    IdKind kind;
    int64_t i;
    Span span; /* the string's text (ID_STR; in a scratch buffer when it had escapes) */
} IdValue;

typedef struct {
    PyObject_HEAD
    int busy; /* a parse runs (set and read with the GIL held) */
    uint32_t stamp; /* the last of `next_stamp` */
    Table cats, names, texts, raws;
    /* per event, reused */
    Buf cat_scratch, name_scratch, str_scratch, argname_scratch, pid_scratch, tid_scratch;
} Reader;

typedef struct {
    /* top-level */
    Span ph, cat, name; /* "" when absent, as msgspec's defaults */
    IdValue pid, tid;
    int has_ts, has_dur; /* present and not null */
    double ts, dur;
    /* args */
    int64_t dense[N_DENSE];
    RareValue rare[N_RARE];
    Span input_dims, input_type;
    int has_argname;
    Span argname;
} Event;

#define key_is(k, n, lit) ((n) == sizeof(lit) - 1 && memcmp((k), (lit), sizeof(lit) - 1) == 0)

/* A string value into a span (its text copied into `scratch` when it had escapes, so that it
 * outlives the next string read). */
static int string_span(Scan *s, Span *span, Buf *scratch, int *escaped) {
    if (!at(s, '"')) {
        s->bail = 1;
        return -1;
    }
    return scan_string(s, &span->p, &span->n, scratch, escaped);
}

/* An integer that fits int64; a float, or an integer beyond int64 (where msgspec's limits on
 * big integers apply), is declined: the msgspec path reads it. */
static int scan_int64(Scan *s, int64_t *value) {
    Num num;
    if (scan_number(s, &num, 0) < 0) return -1;
    if (!num.is_int || !num.ok_int) {
        s->bail = 1;
        return -1;
    }
    *value = num.i;
    return 0;
}

static int scan_int_or_null(Scan *s, int *present, int64_t *value) {
    *present = !is_null(s);
    return *present ? scan_int64(s, value) : 0;
}

static int scan_id(Scan *s, IdValue *id, Buf *scratch) {
    if (at(s, '"')) {
        Span sp;
        if (string_span(s, &sp, scratch, NULL) < 0) return -1;
        id->kind = ID_STR;
        id->span = sp;
        return 0;
    }
    id->kind = ID_INT;
    return scan_int64(s, &id->i);
}

static int scan_float_or_null(Scan *s, int *present, double *value) {
    if (is_null(s)) {
        *present = 0;
        return 0;
    }
    Num num;
    if (scan_number(s, &num, 1) < 0) return -1;
    if (num.is_int && !num.ok_int) {
        s->bail = 1; /* a huge integer as a float: left to the msgspec path */
        return -1;
    }
    *present = 1;
    /* An integer is read as an integer, then made a float (so "-0" is 0.0, not -0.0). */
    *value = num.is_int ? (double)num.i : num.d;
    return 0;
}

/* An event's fields as absent (what is read is guarded by flags, kinds and lengths; clearing
 * the whole struct, ~400 bytes an event, cost a tenth of the parse). */
static void clear_event(Event *ev) {
    ev->ph = ev->cat = ev->name = (Span){(const uchar *)"", 0};
    ev->pid.kind = ev->tid.kind = ID_ABSENT;
    ev->has_ts = ev->has_dur = 0;
    for (int i = 0; i < N_DENSE; i++) ev->dense[i] = MISSING;
    for (int i = 0; i < N_RARE; i++) ev->rare[i].present = 0;
    ev->input_dims = ev->input_type = (Span){NULL, 0};
    ev->has_argname = 0;
}

/* A key given twice: declined (which of the two msgspec keeps is its business). `field`: its
 * bit in `seen`, -1 for a key not read. */
static int first_time(Scan *s, unsigned *seen, int field) {
    if (field < 0) return 0;
    if (*seen & (1u << field)) {
        s->bail = 1;
        return -1;
    }
    *seen |= 1u << field;
    return 0;
}

/* Reads the value of key `k` (s->p at the value) into `ev`. */
typedef int (*FieldReader)(Reader *r, Scan *s, Event *ev, const uchar *k, size_t kn,
                           unsigned *seen);

/* An object at s->p: each key handed to `read` with s->p at its value. A key written with
 * escapes is declined (it might name a field). */
static int scan_object(Reader *r, Scan *s, Event *ev, FieldReader read) {
    if (!at(s, '{')) {
        s->bail = 1;
        return -1;
    }
    s->p++;
    unsigned seen = 0;
    skip_ws(s);
    if (at(s, '}')) {
        s->p++;
        return 0;
    }
    for (;;) {
        skip_ws(s);
        if (!at(s, '"')) {
            s->bail = 1;
            return -1;
        }
        const uchar *k;
        size_t kn;
        int escaped = 0;
        if (scan_string(s, &k, &kn, &r->str_scratch, &escaped) < 0) return -1;
        skip_ws(s);
        if (escaped || !at(s, ':')) {
            s->bail = 1;
            return -1;
        }
        s->p++;
        skip_ws(s);
        if (read(r, s, ev, k, kn, &seen) < 0) return -1;
        skip_ws(s);
        if (at(s, ',')) {
            s->p++;
            continue;
        }
        if (at(s, '}')) {
            s->p++;
            return 0;
        }
        s->bail = 1;
        return -1;
    }
}

/* One key of `args`. */
static int read_arg(Reader *r, Scan *s, Event *ev, const uchar *k, size_t kn, unsigned *seen) {
    int field = -1; /* bit in `seen` */
    int dense = -1, rare = -1;
    if (key_is(k, kn, "correlation")) dense = A_CORRELATION, field = 0;
    else if (key_is(k, kn, "External id")) dense = A_EXTERNAL_ID, field = 1;
    else if (key_is(k, kn, "Sequence number")) dense = A_SEQUENCE_NUMBER, field = 2;
    else if (key_is(k, kn, "stream")) dense = A_STREAM, field = 3;
    else if (key_is(k, kn, "Collective name")) rare = R_COLLECTIVE_NAME, field = 4;
    else if (key_is(k, kn, "dtype")) rare = R_DTYPE, field = 5;
    else if (key_is(k, kn, "In msg nelems")) rare = R_IN_NELEMS, field = 6;
    else if (key_is(k, kn, "Out msg nelems")) rare = R_OUT_NELEMS, field = 7;
    else if (key_is(k, kn, "Group size")) rare = R_GROUP_SIZE, field = 8;
    else if (key_is(k, kn, "Process Group Name")) rare = R_PG_NAME, field = 9;
    else if (key_is(k, kn, "Process Group Description")) rare = R_PG_DESC, field = 10;
    else if (key_is(k, kn, "Process Group Ranks")) rare = R_PG_RANKS, field = 11;
    else if (key_is(k, kn, "Seq")) rare = R_SEQ, field = 12;
    else if (key_is(k, kn, "grid")) rare = R_GRID, field = 13;
    else if (key_is(k, kn, "block")) rare = R_BLOCK, field = 14;
    else if (key_is(k, kn, "Input Dims")) field = 15;
    else if (key_is(k, kn, "Input type")) field = 16;
    else if (key_is(k, kn, "name")) field = 17;
    if (first_time(s, seen, field) < 0) return -1;
    if (dense >= 0) {
        int present = 0;
        int64_t v = 0;
        if (scan_int_or_null(s, &present, &v) < 0) return -1;
        ev->dense[dense] = present ? v : MISSING;
        return 0;
    }
    if (rare >= 0) {
        RareValue *rv = &ev->rare[rare];
        int kind = RARE_KIND[rare];
        if (kind == K_INT) return scan_int_or_null(s, &rv->present, &rv->i);
        if (kind == K_TEXT) {
            if (is_null(s)) {
                rv->present = 0;
                return 0;
            }
            Span sp;
            if (string_span(s, &sp, &r->str_scratch, NULL) < 0) return -1;
            rv->id = table_id(&r->texts, sp.p, sp.n);
            if (rv->id < 0) return -1;
            rv->present = 1;
            return 0;
        }
        const uchar *start = s->p; /* K_RAW: the value's JSON text */
        if (skip_value(s, 1) < 0) return -1;
        rv->id = table_id(&r->raws, start, (size_t)(s->p - start));
        if (rv->id < 0) return -1;
        rv->present = 1;
        return 0;
    }
    if (field == 15 || field == 16) {
        const uchar *start = s->p;
        if (skip_value(s, 1) < 0) return -1;
        Span *sp = field == 15 ? &ev->input_dims : &ev->input_type;
        sp->p = start;
        sp->n = (size_t)(s->p - start);
        return 0;
    }
    if (field == 17) {
        ev->has_argname = !is_null(s);
        return ev->has_argname ? string_span(s, &ev->argname, &r->argname_scratch, NULL) : 0;
    }
    return skip_value(s, 1);
}

/* One top-level key of an event. */
static int read_field(Reader *r, Scan *s, Event *ev, const uchar *k, size_t kn,
                      unsigned *seen) {
    int field = -1;
    if (kn == 2 && k[0] == 'p' && k[1] == 'h') field = 0;
    else if (kn == 3 && memcmp(k, "cat", 3) == 0) field = 1;
    else if (kn == 4 && memcmp(k, "name", 4) == 0) field = 2;
    else if (kn == 3 && memcmp(k, "pid", 3) == 0) field = 3;
    else if (kn == 3 && memcmp(k, "tid", 3) == 0) field = 4;
    else if (kn == 2 && k[0] == 't' && k[1] == 's') field = 5;
    else if (kn == 3 && memcmp(k, "dur", 3) == 0) field = 6;
    else if (kn == 4 && memcmp(k, "args", 4) == 0) field = 7;
    if (first_time(s, seen, field) < 0) return -1;
    switch (field) {
        case 0: {
            int escaped = 0;
            if (string_span(s, &ev->ph, &r->str_scratch, &escaped) < 0) return -1;
            if (escaped) {
                s->bail = 1; /* an escaped phase: left to the msgspec path */
                return -1;
            }
            return 0;
        }
        case 1: return string_span(s, &ev->cat, &r->cat_scratch, NULL);
        case 2: return string_span(s, &ev->name, &r->name_scratch, NULL);
        case 3: return scan_id(s, &ev->pid, &r->pid_scratch);
        case 4: return scan_id(s, &ev->tid, &r->tid_scratch);
        case 5: return scan_float_or_null(s, &ev->has_ts, &ev->ts);
        case 6: return scan_float_or_null(s, &ev->has_dur, &ev->dur);
        case 7: return is_null(s) ? 0 : scan_object(r, s, ev, read_arg);
        default: return skip_value(s, 1);
    }
}

static int scan_event(Reader *r, Scan *s, Event *ev) {
    clear_event(ev);
    skip_ws(s);
    return scan_object(r, s, ev, read_field);
}

/* ------------------------------------------------------------------ the piece */

typedef struct {
    Buf ts, dur, pid, tid, dense[N_DENSE], cat_ids, name_ids;
    Buf rare_rows, rare_values; /* int64 rows; RareValue[N_RARE] per rare row */
    Buf gloo;                   /* (row, dims span, type span) per CPU collective */
    Buf meta, meta_text;        /* MetaRow per metadata event; the bytes they point into */
    Py_ssize_t rows, raw_count, python_events;
    int input_dims, has_collective;
} Out;

typedef struct {
    int64_t row;
    Span dims, type;
} GlooRow;

/* A metadata event's fields, its strings as offsets into Out.meta_text (the scan's spans may
 * point into scratch buffers that the next string overwrites). */
typedef struct {
    size_t off, len;
} TextAt;

typedef struct {
    IdKind kind;
    int64_t i;
    TextAt text;
} IdAt;

typedef struct {
    TextAt kind, name;
    IdAt pid, tid;
} MetaRow;

static void out_free(Out *o) {
    Buf *bufs[] = {&o->ts,       &o->dur,       &o->pid,         &o->tid,
                   &o->cat_ids,  &o->name_ids,  &o->rare_rows,   &o->rare_values,
                   &o->gloo,     &o->dense[0],  &o->dense[1],    &o->dense[2],
                   &o->dense[3], &o->meta,      &o->meta_text};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) buf_free(bufs[i]);
}

static int span_is(Span sp, const char *text) {
    size_t n = strlen(text);
    return sp.n == n && memcmp(sp.p, text, n) == 0;
}

static int keep_text(Out *o, Span sp, TextAt *at) {
    at->off = o->meta_text.n;
    at->len = sp.n;
    return buf_put(&o->meta_text, sp.p, sp.n);
}

static int keep_id(Out *o, IdValue *id, IdAt *at) {
    at->kind = id->kind;
    at->i = id->i;
    at->text.off = at->text.len = 0;
    return id->kind == ID_STR ? keep_text(o, id->span, &at->text) : 0;
}

/* A metadata event ('M') with a name in its args, kept for `metadata_list`. */
static int take_metadata(Out *o, Event *ev) {
    if (!ev->has_argname) return 0;
    MetaRow row;
    if (keep_text(o, ev->name, &row.kind) < 0 || keep_id(o, &ev->pid, &row.pid) < 0 ||
        keep_id(o, &ev->tid, &row.tid) < 0 || keep_text(o, ev->argname, &row.name) < 0)
        return -1;
    return buf_put(&o->meta, &row, sizeof(row));
}

static PyObject *text_object(Out *o, TextAt at) {
    return PyUnicode_DecodeUTF8(o->meta_text.p + at.off, (Py_ssize_t)at.len, "strict");
}

static PyObject *id_object(Out *o, IdAt *id) {
    switch (id->kind) {
        case ID_ABSENT: return PyLong_FromLong(0);
        case ID_INT: return PyLong_FromLongLong(id->i);
        default: return text_object(o, id->text);
    }
}

/* The metadata events kept: [(kind, pid, tid, name)] for the caller. */
static PyObject *metadata_list(Out *o) {
    size_t n = o->meta.n / sizeof(MetaRow);
    const MetaRow *rows = (const MetaRow *)o->meta.p;
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        MetaRow row = rows[i];
        PyObject *kind = text_object(o, row.kind);
        PyObject *pid = kind ? id_object(o, &row.pid) : NULL;
        PyObject *tid = pid ? id_object(o, &row.tid) : NULL;
        PyObject *name = tid ? text_object(o, row.name) : NULL;
        PyObject *item = name ? PyTuple_Pack(4, kind, pid, tid, name) : NULL;
        Py_XDECREF(kind);
        Py_XDECREF(pid);
        Py_XDECREF(tid);
        Py_XDECREF(name);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static int take_complete(Reader *r, Out *o, Scan *s, Event *ev) {
    Span cat = ev->cat;
    if (span_is(cat, "python_function")) {
        o->python_events++;
        return 0;
    }
    if (span_is(cat, "Trace")) return 0;
    if (!ev->has_ts || !ev->has_dur || ev->pid.kind == ID_STR || ev->tid.kind == ID_STR) {
        s->bail = 1; /* no time, or an id the msgspec path turns into a string id */
        return -1;
    }
    Span name = ev->name;
    int32_t cat_id = table_id(&r->cats, cat.p, cat.n);
    if (cat_id < 0) return -1;
    int32_t name_id = table_id(&r->names, name.p, name.n);
    if (name_id < 0) return -1;
    int64_t row = o->rows++;
    int64_t pid = ev->pid.kind == ID_INT ? ev->pid.i : 0;
    int64_t tid = ev->tid.kind == ID_INT ? ev->tid.i : 0;
    if (buf_put(&o->ts, &ev->ts, 8) < 0 || buf_put(&o->dur, &ev->dur, 8) < 0 ||
        buf_put(&o->pid, &pid, 8) < 0 || buf_put(&o->tid, &tid, 8) < 0 ||
        buf_put(&o->cat_ids, &cat_id, 4) < 0 || buf_put(&o->name_ids, &name_id, 4) < 0)
        return -1;
    for (int i = 0; i < N_DENSE; i++)
        if (buf_put(&o->dense[i], &ev->dense[i], 8) < 0) return -1;
    if (ev->input_dims.n) o->input_dims = 1;
    int named = ev->rare[R_COLLECTIVE_NAME].present;
    if (named) o->has_collective = 1;
    if (named || ev->dense[A_STREAM] >= 0) {
        if (buf_put(&o->rare_rows, &row, 8) < 0) return -1;
        if (buf_put(&o->rare_values, ev->rare, sizeof(ev->rare)) < 0) return -1;
    }
    if (ev->input_dims.n && name.n >= 5 && memcmp(name.p, "gloo:", 5) == 0) {
        GlooRow g = {row, ev->input_dims, ev->input_type};
        if (buf_put(&o->gloo, &g, sizeof(g)) < 0) return -1;
    }
    return 0;
}

static PyObject *as_bytes(Buf *b) { return PyBytes_FromStringAndSize(b->p ? b->p : "", b->n); }

/* The names of `ids` not handed over before, in order of first use: [(id, str)]. Marks them
 * handed over only when the whole list is made. */
static PyObject *new_names(Table *t, Buf *ids) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    const int32_t *v = (const int32_t *)ids->p;
    size_t n = ids->n / 4;
    for (size_t i = 0; i < n; i++) {
        Entry *e = &t->entries[v[i]];
        if (e->used) continue;
        e->used = 2; /* provisional: made 1 when the piece is handed over (commit_names) */
        PyObject *str = table_str(t, v[i]);
        PyObject *item = str ? Py_BuildValue("(iN)", (int)v[i], str) : NULL;
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}

static void commit_names(Table *t) {
    for (Py_ssize_t i = 0; i < t->count; i++)
        if (t->entries[i].used == 2) t->entries[i].used = 1;
}

static void rollback_names(Table *t) {
    for (Py_ssize_t i = 0; i < t->count; i++)
        if (t->entries[i].used == 2) t->entries[i].used = 0;
}

/* The strings a piece's column names, each once, in order of first use: [str]; each of
 * `ids` (string ids, -1 absent) is made its string's place in that list, so that what the
 * caller maps grows with the piece, not with the strings read so far. An entry's mark says
 * it was listed for this column already (`stamp`, new per column). */
static PyObject *piece_strings(Table *t, int32_t *ids, size_t n, uint32_t stamp) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0) continue;
        Entry *e = &t->entries[ids[i]];
        if (e->mark != stamp) {
            PyObject *str = table_str(t, ids[i]);
            if (str == NULL || PyList_Append(list, str) < 0) {
                Py_XDECREF(str);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(str);
            e->mark = stamp;
            e->local = (int32_t)(PyList_GET_SIZE(list) - 1);
        }
        ids[i] = e->local;
    }
    return list;
}

/* A new stamp for `piece_strings`; past the last one, every mark is cleared first. */
static uint32_t next_stamp(Reader *r) {
    if (++r->stamp == 0) {
        Table *tables[2] = {&r->texts, &r->raws};
        for (int k = 0; k < 2; k++)
            for (Py_ssize_t i = 0; i < tables[k]->count; i++) tables[k]->entries[i].mark = 0;
        r->stamp = 1;
    }
    return r->stamp;
}

/* The rare columns, one item a field, aligned with the rare rows: an integer field's values
 * as int64 bytes (MISSING where absent); a text or raw field's as the strings it names,
 * each once, and int32 bytes of each row's place in them (-1 where absent; `piece_strings`):
 * the columns take codes, not a Python object a row. */
static PyObject *rare_columns(Reader *r, Out *o) {
    size_t n = o->rare_rows.n / 8;
    const RareValue *values = (const RareValue *)o->rare_values.p;
    PyObject *fields = PyTuple_New(N_RARE);
    if (fields == NULL) return NULL;
    for (int f = 0; f < N_RARE; f++) {
        int kind = RARE_KIND[f];
        size_t width = kind == K_INT ? 8 : 4;
        PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * width));
        if (bytes == NULL) goto fail;
        char *out = PyBytes_AS_STRING(bytes);
        for (size_t i = 0; i < n; i++) {
            const RareValue *v = &values[i * N_RARE + f];
            if (kind == K_INT) {
                int64_t x = v->present ? v->i : MISSING;
                memcpy(out + i * 8, &x, 8);
            } else {
                int32_t x = v->present ? v->id : -1;
                memcpy(out + i * 4, &x, 4);
            }
        }
        if (kind == K_INT) {
            PyTuple_SET_ITEM(fields, f, bytes);
            continue;
        }
        Table *t = kind == K_TEXT ? &r->texts : &r->raws;
        PyObject *strings = piece_strings(t, (int32_t *)out, n, next_stamp(r));
        PyObject *item = strings ? PyTuple_Pack(2, bytes, strings) : NULL;
        Py_DECREF(bytes);
        Py_XDECREF(strings);
        if (item == NULL) goto fail;
        PyTuple_SET_ITEM(fields, f, item);
    }
    return fields;
fail:
    Py_DECREF(fields);
    return NULL;
}

static PyObject *gloo_list(Out *o) {
    size_t n = o->gloo.n / sizeof(GlooRow);
    const GlooRow *rows = (const GlooRow *)o->gloo.p;
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        /* an absent `Input type` is b"" (msgspec's empty Raw), not None */
        const char *type = rows[i].type.p ? (const char *)rows[i].type.p : "";
        PyObject *item = Py_BuildValue("(Ly#y#)", (long long)rows[i].row, rows[i].dims.p,
                                       (Py_ssize_t)rows[i].dims.n, type,
                                       (Py_ssize_t)rows[i].type.n);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

/* The events of the piece into `o`, the GIL released (`s->released` its holder); returns
 * where the closing bracket is (until_close), else -1. Stops with s->bail set where the piece
 * is declined, or with an error noted (pending_error). */
static Py_ssize_t scan_piece(Reader *r, Scan *s, Out *o, const uchar *base, int until_close) {
    Event ev;
    skip_ws(s);
    if (s->p >= s->end) s->bail = 1;
    while (!s->bail) {
        if (scan_event(r, s, &ev) < 0) break;
        o->raw_count++;
        if (span_is(ev.ph, "X")) {
            if (take_complete(r, o, s, &ev) < 0) break;
        } else if (span_is(ev.ph, "M")) {
            if (take_metadata(o, &ev) < 0) break;
        }
        skip_ws(s);
        if (s->p >= s->end) {
            if (until_close) s->bail = 1; /* no closing bracket */
            break;
        }
        if (until_close && *s->p == ']') return s->p - base;
        if (*s->p != ',') {
            s->bail = 1;
            break;
        }
        s->p++;
    }
    return -1;
}

static PyObject *Reader_parse(Reader *r, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, stop;
    int until_close = 0; /* the events run to the array's closing bracket, in the text */
    if (!PyArg_ParseTuple(args, "y*nn|p", &view, &start, &stop, &until_close)) return NULL;
    if (start < 0 || stop > view.len || start > stop) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "piece out of range");
        return NULL;
    }
    if (r->busy) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "this reader is parsing in another thread");
        return NULL;
    }
    r->busy = 1;
    const uchar *base = (const uchar *)view.buf;
    Scan s = {base + start, base + stop, 0, NULL};
    Out o;
    memset(&o, 0, sizeof(o));
    PyObject *result = NULL;
    s.released = PyEval_SaveThread();
    Py_ssize_t closed = scan_piece(r, &s, &o, base, until_close);
    PyEval_RestoreThread(s.released);
    s.released = NULL;
    if (raise_pending() < 0) goto done;
    PyObject *metadata = s.bail ? NULL : metadata_list(&o);
    if (metadata == NULL && !s.bail) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto done;
        PyErr_Clear(); /* not UTF-8 after all: the msgspec path names the byte */
        s.bail = 1;
    }
    if (s.bail) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    PyObject *cats = new_names(&r->cats, &o.cat_ids);
    PyObject *names = cats ? new_names(&r->names, &o.name_ids) : NULL;
    PyObject *rare = names ? rare_columns(r, &o) : NULL;
    PyObject *gloo = rare ? gloo_list(&o) : NULL;
    if (gloo == NULL) {
        Py_XDECREF(cats);
        Py_XDECREF(names);
        Py_XDECREF(rare);
        Py_DECREF(metadata);
        rollback_names(&r->cats);
        rollback_names(&r->names);
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            result = Py_None;
            Py_INCREF(result);
        }
        goto done;
    }
    result = Py_BuildValue(
        "{s:n,s:n,s:n,s:n,s:O,s:O,s:N,s:N,s:N,s:N,s:(NNNN),s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N}",
        "closed", closed, "rows", o.rows, "raw_count", o.raw_count, "python_events", o.python_events,
        "input_dims", o.input_dims ? Py_True : Py_False, "has_collective",
        o.has_collective ? Py_True : Py_False, "ts", as_bytes(&o.ts), "dur", as_bytes(&o.dur),
        "pid", as_bytes(&o.pid), "tid", as_bytes(&o.tid), "dense", as_bytes(&o.dense[0]),
        as_bytes(&o.dense[1]), as_bytes(&o.dense[2]), as_bytes(&o.dense[3]), "cat_ids",
        as_bytes(&o.cat_ids), "new_cats", cats, "name_ids", as_bytes(&o.name_ids), "new_names",
        names, "rare_rows", as_bytes(&o.rare_rows), "rare", rare, "gloo", gloo, "metadata",
        metadata);
    if (result == NULL) {
        rollback_names(&r->cats);
        rollback_names(&r->names);
    } else {
        commit_names(&r->cats);
        commit_names(&r->names);
    }
done:
    out_free(&o);
    r->busy = 0;
    PyBuffer_Release(&view);
    return result;
}

/* A parse's result not taken after all (the caller cut the text anew): its new names are
 * marked as not handed over, so that the next piece using them names them again. */
static PyObject *Reader_forget(Reader *r, PyObject *args) {
    PyObject *lists[2];
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &lists[0], &PyList_Type, &lists[1]))
        return NULL;
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "this reader is parsing in another thread");
        return NULL;
    }
    Table *tables[2] = {&r->cats, &r->names};
    for (int pass = 0; pass < 2; pass++) { /* all checked first: nothing changed on an error */
        for (int k = 0; k < 2; k++) {
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lists[k]); i++) {
                PyObject *item = PyList_GET_ITEM(lists[k], i);
                long id = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2
                              ? PyLong_AsLong(PyTuple_GET_ITEM(item, 0))
                              : -1;
                if (id < 0 || id >= tables[k]->count) {
                    if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_ValueError, "not a name of this reader");
                    return NULL;
                }
                if (pass) tables[k]->entries[id].used = 0;
            }
        }
    }
    Py_RETURN_NONE;
}

static void Reader_dealloc(Reader *r) {
    table_free(&r->cats);
    table_free(&r->names);
    table_free(&r->texts);
    table_free(&r->raws);
    buf_free(&r->cat_scratch);
    buf_free(&r->name_scratch);
    buf_free(&r->str_scratch);
    buf_free(&r->argname_scratch);
    buf_free(&r->pid_scratch);
    buf_free(&r->tid_scratch);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *Reader_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, "")) return NULL;
    Reader *r = (Reader *)type->tp_alloc(type, 0);
    return (PyObject *)r; /* tp_alloc zeroes the tables and scratch buffers */
}

static PyMethodDef Reader_methods[] = {
    {"parse", (PyCFunction)Reader_parse, METH_VARARGS,
     "parse(text, start, stop, until_close=False) -> dict | None: the events in "
     "text[start:stop] (whole events separated by commas, no brackets; with until_close, "
     "up to the array's closing bracket, whose place is 'closed') as columns; None when the "
     "piece is not the plain case (the caller decodes it with msgspec). The GIL is released "
     "while it reads: give it bytes (a buffer another thread changes meanwhile reads as "
     "garbage, safely)."},
    {"forget", (PyCFunction)Reader_forget, METH_VARARGS,
     "forget(new_cats, new_names): a result of parse not taken after all; the names it gave "
     "as new are given again by the next piece that uses them."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fsdp_trace.analysis.read._fastread.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Reader_new,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
    .tp_doc = "Reads pieces of traceEvents text into columns; holds the strings seen so far "
              "(each piece's ids index them).",
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastread",
                                    "Kineto trace events straight into columns.", -1, NULL};

PyMODINIT_FUNC PyInit__fastread(void) {
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* The interface version columns.COMPILED_VERSION expects: raise both with any change of
     * what `parse` takes or gives. */
    if (PyModule_AddIntConstant(m, "VERSION", 4) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
