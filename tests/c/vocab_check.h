/* vocab_check.h - the per-string checks of llama.cpp's vocab test vectors,
 * shared by the SentencePiece and BPE tokenizer tests (included after
 * test.h and tok_util.h, so CHECK counts in the including test). */
#ifndef TL_VOCAB_CHECK_H
#define TL_VOCAB_CHECK_H

/* Each test string must tokenize to its .out ids (add_special = false,
 * parse_special = false, as llama.cpp's test-tokenizer-0) and decode back to
 * itself, except on WordPiece vocabs, which lowercase, drop accents and
 * whitespace by design. Returns how many strings were read; *vv is left at
 * the end. */
static int check_vocab_vectors(const char *name, const tl_tokenizer *t, vocab_vectors *vv) {
    const int lossless = t->kind != TOK_WPM;
    int n_tests = 0, n_tok_ok = 0, n_rt_ok = 0;
    const char *ip;
    size_t slen;
    int32_t want[1024];
    int nw, more;
    while ((more = vv_next(vv, &ip, &slen, want, 1024, &nw)) != 0) {
        CHECK(more > 0, "%s: .out has a line for test %d", name, n_tests);
        if (more < 0) break;
        int32_t *got;
        int ng = encode(t, ip, slen, 0, 0, &got);
        int ok = ng == nw && (nw == 0 || memcmp(got, want, (size_t)nw * sizeof *want) == 0);
        n_tok_ok += ok;
        CHECK(ok, "%s: test %d '%.*s' tokenizes as llama.cpp does", name, n_tests, (int)slen, ip);
        if (!ok) {
            print_ids("want", want, nw);
            print_ids("got ", got, ng);
        }
        int dl = 0;
        char *back = decode(t, got, ng > 0 ? ng : 0, &dl);
        int rt = back && (size_t)dl == slen && memcmp(back, ip, slen) == 0;
        n_rt_ok += rt;
        CHECK(rt || !lossless, "%s: test %d '%.*s' decodes back to itself (got '%s')", name, n_tests, (int)slen, ip,
              back ? back : "(null)");
        free(back);
        free(got);
        n_tests++;
    }
    printf("%s: %d/%d tokenize exactly, %d/%d round-trip%s\n", name, n_tok_ok, n_tests, n_rt_ok, n_tests,
           lossless ? "" : " (lossy: not checked)");
    return n_tests;
}

/* check_vocab_vectors over the vectors beside vocab `path` (PATH.inp and
 * PATH.out). Returns the strings read, or -1 (nothing checked) when either
 * file is missing; *out_done (when given): 1 when .out had no line left. */
static int check_vocab_file(const char *path, const char *name, const tl_tokenizer *t, int *out_done) {
    char pin[1100], pout[1100];
    snprintf(pin, sizeof pin, "%s.inp", path);
    snprintf(pout, sizeof pout, "%s.out", path);
    size_t nin, nout;
    char *inp = read_all(pin, &nin), *out = read_all(pout, &nout);
    int n = -1;
    if (inp && out) {
        vocab_vectors vv;
        vv_init(&vv, inp, nin, out, nout);
        n = check_vocab_vectors(name, t, &vv);
        if (out_done) *out_done = vv.op == vv.oend;
    }
    free(inp);
    free(out);
    return n;
}

#endif
