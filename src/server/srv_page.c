/* srv_page.c — the chat page (page.html) compiled into the binary: one static file, no external
 * assets, served at GET / (srv_http.c). The bytes are the file's, followed by a NUL. */
#include "server/srv_int.h"

__asm__(".section .rodata\n"
        ".global srv_page_html\n"
        ".type srv_page_html, @object\n"
        "srv_page_html:\n"
        ".incbin \"src/server/page.html\"\n"
        ".byte 0\n"
        "srv_page_end:\n"
        ".balign 4\n"
        ".global srv_page_len\n"
        ".type srv_page_len, @object\n"
        "srv_page_len:\n"
        ".long srv_page_end - srv_page_html - 1\n"
        ".previous\n");
