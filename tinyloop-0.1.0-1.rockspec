-- LuaRocks package: builds libtinyloop with the Makefile and installs it with
-- `make install` into the rock's directories (the library in LIBDIR, found by
-- tinyloop.lib through package.cpath; the modules in LUADIR).
--   luarocks make tinyloop-0.1.0-1.rockspec            (from a checkout)
--   luarocks make --tree /opt/rocks tinyloop-0.1.0-1.rockspec
-- Needs gcc, make, libpcre2-dev and luajit (to generate the FFI declarations);
-- the modules run under LuaJIT (OpenResty), not PUC Lua.
rockspec_format = "3.0"
package = "tinyloop"
version = "0.1.0-1"
source = {
    url = "git+https://github.com/tinyloop/tinyloop",
    tag = "v0.1.0",
}
description = {
    summary = "LLM inference engine with a longest-match prefix cache, driven from LuaJIT",
    detailed = [[
An inference engine in C (GGUF models, a radix-tree prefix cache, a
continuous-batching scheduler) with LuaJIT FFI bindings and an
OpenAI-compatible server embedded in OpenResty/nginx.]],
    homepage = "https://github.com/tinyloop/tinyloop",
    -- No license field: the project has not declared one (`luarocks lint`
    -- asks for it; `luarocks make` does not).
}
dependencies = {
    "lua == 5.1",
}
external_dependencies = {
    PCRE2 = { header = "pcre2.h" },
}
build = {
    type = "make",
    build_target = "all",
    install_target = "install",
    install_variables = {
        PREFIX = "$(PREFIX)",
        BINDIR = "$(BINDIR)",
        LIBDIR = "$(LIBDIR)",
        LUADIR = "$(LUADIR)",
    },
}
