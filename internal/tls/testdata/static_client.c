// A blocking HTTPS client with OpenSSL linked statically, for internal/tls's
// test of probes on an executable: static_client PORT CAFILE N [HTTPVERSION]
// (HTTP/1.0: the response body ends when the server closes, so the kernel
// ends it at SSL_free).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char body[] = "{\"stream\": true}";

int main(int argc, char **argv)
{
	const char *version = argc > 4 ? argv[4] : "1.1";
	if (argc < 4) {
		fprintf(stderr, "usage: %s PORT CAFILE N [HTTPVERSION]\n", argv[0]);
		return 2;
	}
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx || SSL_CTX_load_verify_locations(ctx, argv[2], NULL) != 1) {
		ERR_print_errors_fp(stderr);
		return 1;
	}
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	for (int i = 0; i < atoi(argv[3]); i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
		inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
			perror("connect");
			return 1;
		}
		SSL *ssl = SSL_new(ctx);
		SSL_set_fd(ssl, fd);
		SSL_set_tlsext_host_name(ssl, "localhost");
		if (SSL_connect(ssl) != 1) {
			ERR_print_errors_fp(stderr);
			return 1;
		}
		char req[512];
		int n = snprintf(req, sizeof(req),
				 "POST /v1/chat/completions HTTP/%s\r\nHost: localhost:%s\r\n"
				 "Authorization: Bearer TOPSECRET\r\nContent-Type: application/json\r\n"
				 "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
				 version, argv[1], strlen(body), body);
		if (SSL_write(ssl, req, n) != n) {
			ERR_print_errors_fp(stderr);
			return 1;
		}
		char buf[4096];
		long total = 0;
		int r;
		while ((r = SSL_read(ssl, buf, sizeof(buf))) > 0)
			total += r;
		printf("done %ld\n", total);
		fflush(stdout);
		SSL_shutdown(ssl);
		SSL_free(ssl);
		close(fd);
	}
	SSL_CTX_free(ctx);
	return 0;
}
